"""The drive: walk a run's frozen plan, dispatch its units, judge its gates, write its steps.

``loop.drive_run(ctx, run)`` is the entry; ``root.drive_locked_run`` is how the Engine calls
it (under the run lock, with a fresh ``DriveContext``). See docs/architecture.md.
"""
