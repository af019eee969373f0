"""StreamRec's one top-K path over any catalogue size, the recommendation table and its writer, explanations."""
