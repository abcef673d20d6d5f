"""The mechanism: activation capture, patching, attribution, mediation and directions."""
