"""Looking inside a model and making data with it: figures (`plots`), attention maps
(`attention_maps`), head importance and pruning (`heads`), evaluation and decoding tuning
(`evaluation`), back-translation and distillation (`workflows`)."""
