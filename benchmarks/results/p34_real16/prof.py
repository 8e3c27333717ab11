import cProfile, pstats, sys, time, io
import traceap
from traceap.analysis import analyze
t = traceap.load(sys.argv[1])
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable()
a = analyze(t, n_windows=100, detector="expert")
pr.disable(); print("analyze cold", round(time.perf_counter() - t0, 2), "s", len(a.findings), "findings")
t0 = time.perf_counter(); analyze(t, n_windows=100, detector="expert"); print("analyze warm", round(time.perf_counter() - t0, 2))
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(35); print(s.getvalue()[:9000])
