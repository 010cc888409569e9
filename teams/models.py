"""Teams: a lead, its teammates, and their shared task board."""
