"""The pieces of ``benchmarks/bench_interventions.py`` (interventions through three doors, with the
same mix): ``jobs`` (the waiting jobs and their six requests), ``doors`` (store, uvicorn, Ray Serve,
and driving one), ``results`` (statistics and the comparison), ``report`` (tables and the docs
section). The script keeps the run itself and its command line."""
