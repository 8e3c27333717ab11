#!/usr/bin/env bash
# new code (fix/p34m) on the rebuilt benchmark
set -u
cd /work/wt-p34m
PY=/work/main/.venv/bin/python
O=benchmarks/out/p34m
export PYTHONPATH=src
t() { local name=$1; shift; local s=$(date +%s); "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" >> $O/q_new.times; }
t rr_new_val   nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real16 --split validation --detectors expert,hybrid --json $O/rr_new_val.json --show-findings
t rr_new_test  nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real16 --split test_unseen --detectors expert,hybrid --json $O/rr_new_test.json --show-findings
t eval_new_val  nice -n 5 $PY -m traceap eval --dataset /work/datasets/real16 --split validation --detectors expert,hybrid --windows 100 --classifier "" --json --out $O/eval_new_val
t eval_new_test nice -n 5 $PY -m traceap eval --dataset /work/datasets/real16 --split test_unseen --detectors expert,hybrid --windows 100 --classifier "" --json --out $O/eval_new_test
t planted_cost nice -n 5 $PY benchmarks/planted_cost.py --dataset /work/datasets/real16 --split validation,test_unseen --out $O/planted
echo done >> $O/q_new.times
