import re, sys
from pathlib import Path
D = Path("/work/wt-p34m/benchmarks/out/p34m")
def parse(log):
    out, cur = {}, None
    for line in (D / log).read_text().splitlines():
        m = re.match(r"== (\w+): window AUC\s+([\d.]+), trace AUC max\s+([\d.]+).*?accuracy\s+([\d.]+) \(flagged\s+([\d.]+);.*?clean windows flagged\s+([\d.]+)%; healthy traces:\s+([\d.]+)% of windows flagged, ([\d.]+) medium", line)
        if m:
            cur = m.group(1); out[cur] = {"_pooled": m.groups()[1:]}
            continue
        m = re.match(r"([a-z_]+)\s+(\d+)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)$", line)
        if m and cur and m.group(1) not in out[cur]:
            out[cur][m.group(1)] = m.groups()[1:]
    return out
if __name__ == "__main__":
    runs = sys.argv[1:]
    data = [parse(r) for r in runs]
    for det in ("expert", "hybrid"):
        print(f"\n### {det}: window AUC / acc (all) / acc|flag, " + " | ".join(runs))
        pats = [p for p in data[-1][det] if p != "_pooled"]
        print("| pattern | " + " | ".join(runs) + " |")
        print("| pooled (win AUC, trace AUC, acc, acc|flag, clean flagged%, healthy flagged%, healthy findings) | " + " | ".join(" ".join(d[det]["_pooled"]) if det in d else "-" for d in data) + " |")
        for p in pats:
            cells = []
            for d in data:
                v = d.get(det, {}).get(p)
                cells.append("-" if v is None or v[1] == "-" else f"{v[1]} / {v[3]} / {v[4]} (n={v[0]})")
            print(f"| {p} | " + " | ".join(cells) + " |")
