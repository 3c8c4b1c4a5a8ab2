"""How plans are compared: racing repeats, the tie rule on paired pipeline seconds, and the confirmation
round that re-measures the best against the references."""
