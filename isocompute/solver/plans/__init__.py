"""Plans: wave schedules and stopping rules, the vote lattice, and their exact and Monte Carlo estimators."""
