"""Pure analysis over what was read: phases, progress, steps, groups, collectives, exits and the verdict."""
