"""The commands of run.py, one module each: `NAME`, `add_parser(sub, help)` and `run(args) -> exit code`.

run.py imports only the module of the command it runs, so each command's dependencies load with it
alone (`train` never imports torch); `common` holds what several share.
"""
