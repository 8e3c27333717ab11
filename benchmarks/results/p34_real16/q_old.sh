#!/usr/bin/env bash
# pre-#34 main (wt-base) on the old benchmark, then new code on the old benchmark
set -u
O=/work/wt-p34m/benchmarks/out/p34m
PY=/work/main/.venv/bin/python
t() { local name=$1; shift; local s=$(date +%s); "$@" > $O/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" >> $O/q_old.times; }
cd /work/wt-base
export PYTHONPATH=/work/wt-base/src
t rr_old_val   nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real --split validation --detectors expert,hybrid --show-findings
t rr_old_test  nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real --split test_unseen --detectors expert,hybrid --show-findings
t eval_old_val  nice -n 5 $PY -m traceap eval --dataset /work/datasets/real --split validation --detectors expert,hybrid --windows 100 --classifier "" --json --out $O/eval_old_val
t eval_old_test nice -n 5 $PY -m traceap eval --dataset /work/datasets/real --split test_unseen --detectors expert,hybrid --windows 100 --classifier "" --json --out $O/eval_old_test
cd /work/wt-p34m
export PYTHONPATH=src
t rr_newcode_olddata_test nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real --split test_unseen --detectors expert,hybrid --json $O/rr_newcode_olddata_test.json
t rr_newcode_olddata_val nice -n 5 $PY benchmarks/real_rules_report.py --dataset /work/datasets/real --split validation --detectors expert,hybrid --json $O/rr_newcode_olddata_val.json
t real_findings nice -n 5 $PY benchmarks/real_findings.py /work/shared/traces /work/wt-p34m/examples --detector hybrid --out $O/real_findings
echo done >> $O/q_old.times
