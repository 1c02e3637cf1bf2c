"""Project a 2-rank `zbench run` table to more ranks of the same machine kind, for when no machine with
that many GPUs is available. A projection, not a measurement: see the assumptions printed with it.

    python docs/benchmarks/scripts/scaling_projection.py RUN/results.json --ranks 4 8

Per variant, from the run's steady step time T2 and its measured floor (forward+backward alone F on one
GPU, optimizer phase O over one rank's shard at 2 ranks):
  E2 = T2 - F - O2          everything else at 2 ranks: exposed communication and engine overhead
  O_N = O2 * 2 / N          sharded engines (the shard shrinks); DDP keeps the whole optimizer (O_N = 2 * O2)
  bytes per rank grow by 2(N-1)/N over 2 ranks (ring reduce-scatter / all-gather / all-reduce)
  T_N between F + O_N + E2           (the extra traffic stays hidden, as most of it is at 2 ranks)
          and F + O_N + E2 * 2(N-1)/N  (all of E2 is communication, and it grows with the bytes)
Per-GPU bandwidth is taken as equal on the 8-GPU host (NVSwitch gives every GPU its full NVLink rate).
"""

from __future__ import annotations

import argparse
import json


def project(results: dict, ranks: list[int]) -> list[dict]:
    floor = results["floor"]
    f, o_shard = floor["fwd_bwd_ms"], floor["optimizer_ms"]
    world = results["world_size"]
    tokens_per_gpu_step = floor["batch"] * results["variants"][0]["seq_len"]
    rows = []
    for v in results["variants"]:
        if v.get("status") != "ok" or v.get("world_size") != world:
            continue
        t2 = v["step_ms"]
        sharded = v["engine"] != "ddp"
        o2 = o_shard if sharded else o_shard * world
        e2 = t2 - f - o2
        row = {
            "variant": v["variant"],
            "method": v["method"],
            "t2": t2,
            "e2": e2,
            "tps_gpu_2": tokens_per_gpu_step / t2 * 1e3,
        }
        for n in ranks:
            o_n = o2 * world / n if sharded else o2
            grow = 2 * (n - 1) / n / (2 * (world - 1) / world)
            fast, slow = f + o_n + e2, f + o_n + e2 * grow
            row[n] = {
                "t_fast": fast,
                "t_slow": slow,
                "tps_gpu": (tokens_per_gpu_step / slow * 1e3, tokens_per_gpu_step / fast * 1e3),
                "eff": (t2 / slow, t2 / fast),
            }
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8])
    a = ap.parse_args()
    results = json.load(open(a.results))
    rows = project(results, a.ranks)
    fl = results["floor"]
    print(
        f"floor: forward+backward {fl['fwd_bwd_ms']:.1f} ms, optimizer phase {fl['optimizer_ms']:.1f} ms at "
        f"{results['world_size']} ranks; measured at {results['world_size']} ranks on {results['device']}\n"
    )
    head = "| variant | measured step ms (2 ranks) | E2 ms | tokens/s/GPU (2) |"
    for n in a.ranks:
        head += f" projected step ms ({n}) | tokens/s/GPU ({n}) | scaling efficiency 2->{n} |"
    print(head)
    print("|" + "---|" * (4 + 3 * len(a.ranks)))
    for r in rows:
        line = f"| {r['variant']} | {r['t2']:.1f} | {r['e2']:.1f} | {r['tps_gpu_2']:,.0f} |"
        for n in a.ranks:
            p = r[n]
            line += (
                f" {p['t_fast']:.1f}-{p['t_slow']:.1f} | {p['tps_gpu'][0]:,.0f}-{p['tps_gpu'][1]:,.0f} |"
                f" {p['eff'][0]:.0%}-{p['eff'][1]:.0%} |"
            )
        print(line)


if __name__ == "__main__":
    main()
