"""The policy's plan menu, plan arrays, and the best fixed plan (the never-worse chain's middle rule)."""
