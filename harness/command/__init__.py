"""The command line (`python -m harness ...`), the stage a user meets: cli reads the words and
calls one command; sweep runs a new sweep or a resume (resume) from composing its config to
its end on the terminal (closing); status, show, again and code look at sweeps without running
a point. May import every other stage; nothing imports it but harness.__main__."""
