"""Launchers: where a sweep's points run. dispatch hands a plan's points to the launcher the
config names (protocol: what any launcher is asked) and follows them to their end: here in this
process (in_process, the default), on warm workers forked from a preloaded forkserver (local,
workers, warm, fresh), as SLURM job arrays (slurm, submitit_jobs, slurm_cli) or through any
other Hydra launcher plugin (hydra_plugin). Wherever a point runs, it runs harness.running.job.
May import running, tracking, planning and below; never command."""
