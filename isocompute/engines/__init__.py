"""Generation back-ends behind one async protocol."""
