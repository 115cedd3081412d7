# Sourced by bench/memlimit.sh, bound.sh and serve.sh: the model their runs share, synthesized and
# packed on first use, and the memory limit (FRACTION of its size, default half) with the arena
# that fits in it.
#   DIR (/tmp): where the model lives (in DIR/expertd-memlimit); LAYERS (12), PRESET
#   (qwen3-30b-a3b), TYPE (Q4_K); DOWN_TYPE: the expert down tensors of that type; EXPERT_TYPE:
#   every routed-expert tensor of that type; ROUTING: synth's --routing (zipf; balanced: no
#   expert favoured, as Kimi-K3's router); FRACTION (0.5): the limit as a fraction of the model,
#   e.g. 0.4 for DeepSeek-V4-Flash on a 64 GB laptop (the seed's ratio).
# Sets dir, m (the model's file name), size, core, limit (bytes) and cache_mib.
dir=${DIR:-/tmp}/expertd-memlimit
layers=${LAYERS:-12}
preset=${PRESET:-qwen3-30b-a3b}
type=${TYPE:-Q4_K}
down=$([ -n "${DOWN_TYPE:-}" ] && echo "--down-type $DOWN_TYPE" || true)
experts=$([ -n "${EXPERT_TYPE:-}" ] && echo "--gate-type $EXPERT_TYPE --up-type $EXPERT_TYPE --down-type $EXPERT_TYPE" || true)
routing=${ROUTING:-zipf}
m=$preset-$layers-$type${DOWN_TYPE:+-$DOWN_TYPE}${EXPERT_TYPE:+-x$EXPERT_TYPE}$([ "$routing" = zipf ] || echo "-$routing")
mkdir -p "$dir"
[ -f "$dir/$m.gguf" ] || build/pack/expert-pack -q synth --preset "$preset" --layers "$layers" --type "$type" $down $experts --routing "$routing" --out "$dir/$m.gguf"
[ -f "$dir/$m.manifest.json" ] || build/pack/expert-pack -q build "$dir/$m.gguf" >/dev/null
size=$(stat -c %s "$dir/$m.gguf")
core=$(stat -c %s "$dir/$m.core.gguf")
fraction=${FRACTION:-0.5}
limit=$(python3 -c "print(int($size * $fraction))")
# The arena gets what the limit leaves after the core GGUF and 384 MiB for everything else.
cache_mib=$(((limit - core) / 1048576 - 384))
model_line="model $preset $((size >> 20)) MiB ($layers layers, $type${DOWN_TYPE:+ with $DOWN_TYPE down}${EXPERT_TYPE:+ with $EXPERT_TYPE experts}), core $((core >> 20)) MiB; limit $((limit >> 20)) MiB ($fraction of the model); routing $routing; expertd cache $cache_mib MiB"
