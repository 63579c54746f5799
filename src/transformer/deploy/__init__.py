"""A model outside the package: exported to CTranslate2 (`export`) and run by it
(`engines`), to and from Hugging Face (`hf`), and served over HTTP (`serve`)."""
