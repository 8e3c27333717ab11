import cProfile, pstats, sys, io
import traceap
from traceap import idle
t = traceap.load(sys.argv[1])
pr = cProfile.Profile(); pr.enable(); idle.measure(t); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25); print(s.getvalue()[:6000])
