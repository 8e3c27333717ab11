#!/usr/bin/env bash
# bench_analyze.py on the 205 MB replay, pre-#34 main (wt-base) and fix/p34m, alternated
set -u
O=/work/wt-p34m/benchmarks/out/p34m
PY=/work/main/.venv/bin/python
T=/work/main/benchmarks/out/bench_analyze_200MB.json
for i in 1 2 3; do
  for side in base new; do
    dir=/work/wt-base; [ $side = new ] && dir=/work/wt-p34m
    ( cd $dir && PYTHONPATH=$dir/src nice -n 5 $PY benchmarks/bench_analyze.py --trace $T ) > $O/bench_${side}_$i.log 2>&1
    echo "$side $i rc=$?" >> $O/bench.times
  done
done
echo done >> $O/bench.times
