"""What one stage does on one rank: build it, train it, time and check it, the rank's lasting state, its
messages and timelines."""
