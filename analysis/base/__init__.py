"""The ground every other room of analysis stands on: its errors, the bootstrap's Estimate, the thread pool."""
