"""What a training run is made of: its configuration (`config`, documented key by key in
`config_docs`), its tokenizers (`tokenizers`), its prepared data (`data`) and its
checkpoints (`checkpoint`)."""
