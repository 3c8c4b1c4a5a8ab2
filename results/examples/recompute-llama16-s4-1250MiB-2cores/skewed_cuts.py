import statistics
from pipeline.core.plan import SplitPlan, SplitPoint
from pipeline.models.build import resolve_spec
from pipeline.ranks.launch import open_pool
from pipeline.rounds import interleaved
if __name__ == "__main__":
    kw = {"num_hidden_layers": 16, "hidden_size": 128, "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256}
    spec = resolve_spec("hf:llama", kwargs=kw, batch_size=8, seq_len=512)
    def plan(cuts, rc): return SplitPlan(model=spec, split_points=tuple(SplitPoint(f"model.layers.{c}") for c in cuts), chunks=4, schedule="1F1B", mode="train", recompute=rc, threads_per_stage=1)
    plans = [plan((1,4,9), "none"), plan((2,5,10), "none"), plan((2,6,11), "none"), plan((4,8,12), "2,2,2,2"), plan((4,8,12), "2,1,0,0")]
    with open_pool(4, threads_per_stage=1, quiet=True) as pool:
        runs = interleaved(pool, plans, 2, repeats=2, serial=False, drop_failed=True)
    for i, p in enumerate(plans):
        res = runs.results[i]
        secs = [s for r in res for s in r.pipeline_s]
        peaks = [max(r.peak_mem_bytes[k] for r in res)//2**20 for k in range(4)] if res else []
        print(p.split_spec(), p.recompute, "median s", round(statistics.median(secs),3) if secs else None, "min-max", (round(min(secs),3), round(max(secs),3)) if secs else None, "peaks", peaks, runs.failures.get(i))
