"""The long-context task suite: RULER's synthetic tasks (Hsieh et al., 2024) and the passkey, generated offline."""
