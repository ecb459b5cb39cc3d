"""Model specs: Hugging Face configs and shipped profiles turned into one frozen ModelSpec."""
