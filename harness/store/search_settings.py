"""A search's settings as a config gives them and a manifest records them: the choices each
takes, and the shape they must have whatever the experiment (harness.searching.search checks the
rest). The store reads a manifest's with it, below the search itself."""

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "successive_halving", "hyperband", "none")
DIRECTIONS = ("maximize", "minimize")


def shape_fault(node) -> str | None:
    """What makes a search's settings unusable whatever the experiment (a count that is none, a
    mapping that is not one, a sampler not known), in a line; None where nothing does. Planning
    checks a config's with it, and every reader of a manifest the one recorded there."""
    if not isinstance(node, dict) or not isinstance(node.get("params"), dict):
        return f"search must be a mapping with its params, not {str(node)[:40]!r}"
    for key in ("trials", "report_every"):
        count = node.get(key)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return f"search.{key} must be a positive integer, got {count!r:.40}"
    if not isinstance(node.get("objective"), str) or not node["objective"]:
        return "search.objective must name a metric of the point's rows (accuracy)"
    for key in ("where", "prune_on", "sampler_options", "pruner_options"):
        if not isinstance(node.get(key) or {}, dict):
            return f"search.{key} must be a mapping (where: {{phase: eval}})"
    for key, allowed in (("direction", DIRECTIONS), ("sampler", SAMPLERS), ("pruner", PRUNERS)):
        if node.get(key) not in allowed:
            return f"search.{key} must be one of {', '.join(allowed)}, got {node.get(key)!r:.40}"
    return None
