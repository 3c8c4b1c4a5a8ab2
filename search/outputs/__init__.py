"""What a user reads and takes away: ``best_split.json``, the summary, the timelines and the plots."""
