"""fbands: probability-aware trust regions for reinforcement learning on language models."""
