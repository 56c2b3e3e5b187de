"""What a cell is fed: seeded random ids, the built-in passkey retrieval prompts, or the user's own prompts."""
