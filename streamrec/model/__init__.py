"""StreamRec's networks (`sasrec`), their training logic (`module`), losses and ranking metrics."""
