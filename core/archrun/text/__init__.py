"""Text in and out: the tokenizer, chat templates, and thinking split from answers."""
