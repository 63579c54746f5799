"""Training a model: the trainer (`trainer`), its learning-rate schedule and budget
(`schedule`), the optimizer (`optimizer`) and what a run reports (`log`)."""
