"""The study's loop: its configuration, the context a search shares, the objective one trial runs, the loop
that seeds and runs trials, and the dashboard notes each trial leaves."""
