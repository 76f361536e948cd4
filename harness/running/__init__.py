"""Running a point: job sets up the point's job (its config, folder, log, provenance, sinks,
tracker), calls the experiment and writes its rows; sinks copy rows elsewhere as they land,
distributed makes one point a group of processes. May import tracking, planning, searching,
pinning, store and the root modules; never launchers or command."""
