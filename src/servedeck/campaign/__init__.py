"""Campaigns: one file declares launches (variants × repeats) and workloads; servedeck runs every cell unattended.

    file.py      the campaign file: read, validated (every key path named), its matrix expanded into variants
    cells.py     the cells (variant × repeat), their states, which run next and side by side
    runner.py    `campaign run`: the one owner of the cells' states; `LocalPlacement` (this host) or a placement
                 passed in (cluster/dispatch.py's Ray); `plan_campaign` for `campaign plan`
    steps.py     a cell's steps wherever it runs: launch every replica, its gates, each workload, stop
    accuracy.py  the gates a cell runs, from the file's gate keys
    folder.py    the campaign folder: campaign.json (the cells' record), campaign.toml frozen, campaign.md
    summary.py   campaign.md and `campaign status`, rebuilt from the run folders

What one server is measured with (the gate, every workload kind, the run folder each makes) is the workloads
package's: a cell runs each [[workloads]] entry through workloads/kinds.py's registry and workloads/session.py.
"""
