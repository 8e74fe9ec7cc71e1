"""`servedeck tune FILE`: a search over engine flags for the most good requests/s per GPU within an SLO.

    space.py      the [search] table: knobs (categorical, integer and log ranges, sets of keys taken together,
                  `when` conditions), `require` rules, the budget; pure
    file.py       the tune file: a campaign file whose variants the search chooses; each trial a one-variant campaign
    objective.py  a trial's verdict (measured, or why not) and what the search is told; the best by the verdict
                  rules (report/recommend.py); pure
    runner.py     the loop: the starter, then Optuna's TPE trials, each through the campaign Runner, then the
                  verification campaign; resumable
    verify.py     the verification of the best few: candidates, each repeat's figure, the verdict (from 3 rounds a
                  paired interval of the lead above 0; with 2, the median beats the starter's by more than the
                  spread); pure
    importance.py how much each searched entry moved the objective (Optuna's fANOVA over study.db), for `tune show`
    folder.py     the tune folder: tune.toml, tune.json, tune.md, study.db (Optuna's SQLite)
    storage.py    where the study lives: study.db in the folder, or a database named with --storage (PostgreSQL)
    apply.py      `tune apply`: the verified winner's values into models.toml (tomlkit), each with its `why`; pure
"""
