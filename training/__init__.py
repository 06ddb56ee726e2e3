"""Tools that build the models' training data and train them; not part of the installed product."""
