"""The subjects (attention, the octlm model) and the experiments: plain functions returning rows."""
