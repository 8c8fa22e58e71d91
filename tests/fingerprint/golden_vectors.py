#!/usr/bin/env python3
"""Golden vectors for kvtier fingerprints, namespace ids and ring positions.

An independent implementation (stdlib only: hashlib, struct) of the byte layout in
docs/fingerprints.md. It shares no code with the C++ implementation in client_lib/src/common/.

  golden_vectors.py --write tests/data/fingerprint_golden.txt   # (re)generate the vectors
  golden_vectors.py --check tests/data/fingerprint_golden.txt   # recompute; exit 1 on any mismatch

The C++ test kvtier_common_unit_test parses the same file and checks the C++ implementation against it.
"""

import argparse
import bisect
import hashlib
import struct
import sys

SCHEME_VERSION = 1
HASH_SHA256 = 1

KINDS = {"standard": 1, "mla": 2}
DTYPES = {"fp16": 1, "bf16": 2, "fp32": 3, "fp8_e4m3": 4}
CODECS = {"none": 0, "fp8_e4m3": 1, "int8": 2}

VOCAB = 128256
LCG_MUL = 6364136223846793005
LCG_ADD = 1442695040888963407
MASK64 = (1 << 64) - 1


# --- Primitive encodings (docs/fingerprints.md, "Primitive encodings") ---------------------------

def u8(v):
    return struct.pack("<B", v)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def enc_str(s):
    return u32(len(s)) + s


def enc_opt_str(s):
    return b"\x00" if s is None else b"\x01" + enc_str(s)


# --- Namespace, chain, ring ---------------------------------------------------------------------

def canonical_bytes(v):
    """CanonicalBytes() of the namespace in vector `v` (a dict of parsed fields)."""
    mla = v["kind"] == "mla"
    quantized = v["codec"] != "none"
    return b"".join([
        u8(SCHEME_VERSION),
        u8(HASH_SHA256),
        enc_str(v["tenant"]),
        enc_str(v["model"]),
        enc_opt_str(v["revision"]),
        u8(KINDS[v["kind"]]),
        u8(DTYPES[v["dtype"]]),
        u8(CODECS[v["codec"]]),
        u32(v["layers"]),
        u32(0 if mla else v["kv_heads"]),
        u32(0 if mla else v["head_dim"]),
        u32(v["latent_dim"] if mla else 0),
        u32(v["block_tokens"]),
        u32(v["tp"]),
        u32(v["group"] if quantized else 0),
    ])


def namespace_id(canonical):
    return struct.unpack("<Q", hashlib.sha256(canonical).digest()[:8])[0]


def extra_bytes(v, i):
    """extra(i): LoRA, then the overlapping multimodal inputs, then (block 0 only) the cache salt."""
    b = v["block_tokens"]
    out = b""
    if v["lora"] is None:
        out += b"\x00"
    else:
        adapter_id, version = v["lora"]
        out += b"\x01" + enc_str(adapter_id) + u64(version)
    begin, end = i * b, (i + 1) * b
    overlapping = [m for m in v["mm"] if m[1] < end and m[1] + m[2] > begin]
    out += u32(len(overlapping))
    for content_hash, offset, length in overlapping:
        out += enc_str(content_hash) + u32(offset) + u32(length)
    if i == 0:
        out += enc_opt_str(v["cache_salt"])
    return out


def chain(v):
    b = v["block_tokens"]
    tokens = v["tokens"]
    fps = []
    for i in range(len(tokens) // b):
        head = canonical_bytes(v) + enc_opt_str(v["tenant_salt"]) if i == 0 else fps[-1]
        body = struct.pack("<%dI" % b, *tokens[i * b:(i + 1) * b])
        fps.append(hashlib.sha256(head + body + extra_bytes(v, i)).digest())
    return fps


def ring_position(fp):
    return struct.unpack("<Q", fp[:8])[0]


def vnode_position(member, index):
    return struct.unpack("<Q", hashlib.sha256(member + b"\x00" + u32(index)).digest()[:8])[0]


def owners(members, vnodes, fp, replicas):
    # Ties on position go to the smaller node id, whatever order the members were listed in.
    points = sorted((vnode_position(m, i), m, k) for k, m in enumerate(members) for i in range(vnodes))
    positions = [p[0] for p in points]
    at = bisect.bisect_left(positions, ring_position(fp))
    chosen = []
    for step in range(len(points)):
        k = points[(at + step) % len(points)][2]
        if k not in chosen:
            chosen.append(k)
        if len(chosen) == min(replicas, len(members)):
            break
    return chosen


# --- Deterministic tokens -----------------------------------------------------------------------

def lcg_tokens(seed, count):
    x, out = seed, []
    for _ in range(count):
        x = (x * LCG_MUL + LCG_ADD) & MASK64
        out.append((x >> 33) % VOCAB)
    return out


# --- The vectors --------------------------------------------------------------------------------

LLAMA8B = dict(kind="standard", dtype="bf16", codec="none", layers=32, kv_heads=8, head_dim=128,
               latent_dim=0, block_tokens=16, tp=1, group=64)


def fp_spec(name, tokens, **overrides):
    v = dict(name=name, tenant=b"acme", model=b"meta-llama/Llama-3.1-8B", revision=None, tenant_salt=None,
             lora=None, mm=[], cache_salt=None, tokens=tokens, **LLAMA8B)
    v.update(overrides)
    return v


def fp_specs():
    lcg50 = "lcg:1:50"  # 3 full blocks of 16 and a partial one
    return [
        fp_spec("standard_bf16_basic", lcg50),
        fp_spec("revision_empty", lcg50, revision=b""),
        fp_spec("revision_set", lcg50, revision=b"5206a32e0bd3067aef1ce90f5528ade7d866253f"),
        fp_spec("tenant_salt_empty", lcg50, tenant_salt=b""),
        fp_spec("tenant_salt_binary", lcg50, tenant_salt=bytes([0, 1, 2, 255]) + b"s3cret"),
        fp_spec("tenant_other", lcg50, tenant=b"globex"),
        fp_spec("model_other", lcg50, model=b"meta-llama/Llama-3.1-70B"),
        fp_spec("fp16_tp4_b32", "lcg:2:100", dtype="fp16", tp=4, block_tokens=32),
        fp_spec("fp32_unused_group_normalised", lcg50, dtype="fp32", group=128),
        fp_spec("fp8_dtype_tp8", lcg50, dtype="fp8_e4m3", tp=8),
        fp_spec("quantized_fp8_codec_g32_tp2", "lcg:3:96", codec="fp8_e4m3", group=32, tp=2, block_tokens=32),
        fp_spec("quantized_int8_codec_g64", lcg50, codec="int8", group=64),
        # MLA: num_kv_heads and head_dim are given but must be written as 0.
        fp_spec("mla_deepseek_b64_tp8", "lcg:4:200", model=b"deepseek-ai/DeepSeek-V3", kind="mla", layers=61,
                latent_dim=576, block_tokens=64, tp=8),
        fp_spec("mla_quantized_int8", "lcg:5:130", model=b"deepseek-ai/DeepSeek-V3", kind="mla", layers=61,
                kv_heads=0, head_dim=0, latent_dim=512, block_tokens=64, codec="int8", group=64),
        fp_spec("lora", lcg50, lora=(b"sql-adapter", 3)),
        fp_spec("lora_other_version", lcg50, lora=(b"sql-adapter", 4)),
        # Input A spans tokens 10..21: blocks 0 and 1. B spans 40..47: block 2. C starts past the end.
        fp_spec("multimodal_across_block_boundary", "lcg:6:64",
                mm=[(hashlib.sha256(b"image-a").digest(), 10, 12), (b"audio-b", 40, 8), (b"image-c", 70, 5)]),
        fp_spec("multimodal_shifted_offset", "lcg:6:64",
                mm=[(hashlib.sha256(b"image-a").digest(), 11, 12), (b"audio-b", 40, 8), (b"image-c", 70, 5)]),
        fp_spec("cache_salt_empty", lcg50, cache_salt=b""),
        fp_spec("cache_salt_set", lcg50, cache_salt=b"request-salt-42"),
        fp_spec("everything", "lcg:7:80", revision=b"v2", tenant_salt=b"pepper", lora=(b"chat", 1),
                mm=[(b"img0", 0, 16), (b"img1", 30, 20)], cache_salt=b"cs", codec="int8", group=32, tp=2),
        fp_spec("extreme_token_ids_b2", "list:0,1,4294967295,65536,7", block_tokens=2),
        fp_spec("one_token_short_of_a_block", "lcg:1:15"),
        fp_spec("empty_prompt", "list:"),
        fp_spec("b256_long", "lcg:8:1030", block_tokens=256),
    ]


RING_MEMBERS = [b"node-a", b"node-b", b"node-c"]


def ring_specs():
    probes = [hashlib.sha256(b"ring-probe-%d" % k).digest() for k in range(6)]
    specs = []
    for k, fp in enumerate(probes):
        specs.append(dict(name="ring3_probe%d" % k, members=RING_MEMBERS, vnodes=128, fp=fp))
    # The same ring listed in another order: indices change, owners by id must not.
    for k, fp in enumerate(probes[:2]):
        specs.append(dict(name="ring3_reordered_probe%d" % k, members=RING_MEMBERS[::-1], vnodes=128, fp=fp))
    # Positions at the ends of the ring: the first point at or after 0, and the wrap after 2^64 - 1.
    specs.append(dict(name="ring3_position_zero", members=RING_MEMBERS, vnodes=128, fp=bytes(32)))
    specs.append(dict(name="ring3_position_max", members=RING_MEMBERS, vnodes=128,
                      fp=b"\xff" * 8 + bytes(24)))
    return specs


def vnode_specs():
    return [dict(name="vnode_%s_%d" % (m.decode(), i), member=m, index=i)
            for m, i in [(b"node-a", 0), (b"node-a", 127), (b"node-b", 1), (b"node-c", 64)]]


# --- File format (docs/fingerprints.md, "Golden vector file format") ------------------------------

def hex_opt(s):
    return "-" if s is None else s.hex()


def parse_opt(s):
    return None if s == "-" else bytes.fromhex(s)


def parse_tokens(text):
    kind, _, rest = text.partition(":")
    if kind == "list":
        return [int(t) for t in rest.split(",")] if rest else []
    if kind == "lcg":
        seed, count = rest.split(":")
        return lcg_tokens(int(seed), int(count))
    raise ValueError("bad tokens field: " + text)


def fp_inputs_to_fields(v):
    lora = "-" if v["lora"] is None else "%s:%d" % (v["lora"][0].hex(), v["lora"][1])
    mm = ",".join("%s:%d:%d" % (h.hex(), o, n) for h, o, n in v["mm"])
    return [
        ("tenant", v["tenant"].hex()), ("model", v["model"].hex()), ("revision", hex_opt(v["revision"])),
        ("tenant_salt", hex_opt(v["tenant_salt"])), ("kind", v["kind"]), ("dtype", v["dtype"]),
        ("codec", v["codec"]), ("layers", v["layers"]), ("kv_heads", v["kv_heads"]),
        ("head_dim", v["head_dim"]), ("latent_dim", v["latent_dim"]), ("block_tokens", v["block_tokens"]),
        ("tp", v["tp"]), ("group", v["group"]), ("lora", lora), ("mm", mm),
        ("cache_salt", hex_opt(v["cache_salt"])), ("tokens", v["tokens"]),
    ]


def parse_fp_fields(f):
    lora = None
    if f["lora"] != "-":
        adapter_id, version = f["lora"].split(":")
        lora = (bytes.fromhex(adapter_id), int(version))
    mm = []
    for item in filter(None, f["mm"].split(",")):
        h, o, n = item.split(":")
        mm.append((bytes.fromhex(h), int(o), int(n)))
    v = dict(tenant=bytes.fromhex(f["tenant"]), model=bytes.fromhex(f["model"]),
             revision=parse_opt(f["revision"]), tenant_salt=parse_opt(f["tenant_salt"]), kind=f["kind"],
             dtype=f["dtype"], codec=f["codec"],
             lora=lora, mm=mm, cache_salt=parse_opt(f["cache_salt"]))
    for key in ("layers", "kv_heads", "head_dim", "latent_dim", "block_tokens", "tp", "group"):
        v[key] = int(f[key])
    v["tokens"] = parse_tokens(f["tokens"])
    return v


def fp_outputs(v):
    canonical = canonical_bytes(v)
    return [("canonical", canonical.hex()), ("ns_id", namespace_id(canonical)),
            ("fps", ",".join(fp.hex() for fp in chain(v)))]


def ring_outputs(members, vnodes, fp):
    owner_list = owners(members, vnodes, fp, len(members))
    return [("position", ring_position(fp)), ("owners", ",".join(str(k) for k in owner_list))]


def line(record, name, fields):
    return " ".join([record, "name=" + name] + ["%s=%s" % (k, val) for k, val in fields])


def write(path):
    lines = [
        "# kvtier fingerprint golden vectors: generated by tests/fingerprint/golden_vectors.py --write,",
        "# checked by golden_vectors.py --check and by kvtier_common_unit_test.",
        "# Format: docs/fingerprints.md.",
    ]
    for spec in fp_specs():
        v = dict(spec)
        fields = fp_inputs_to_fields(v)
        v["tokens"] = parse_tokens(spec["tokens"])
        lines.append(line("fp", spec["name"], fields + fp_outputs(v)))
    for spec in ring_specs():
        fields = [("members", ",".join(m.hex() for m in spec["members"])), ("vnodes", spec["vnodes"]),
                  ("fp", spec["fp"].hex())]
        outputs = ring_outputs(spec["members"], spec["vnodes"], spec["fp"])
        lines.append(line("ring", spec["name"], fields + outputs))
    for spec in vnode_specs():
        position = vnode_position(spec["member"], spec["index"])
        lines.append(line("vnode", spec["name"], [("member", spec["member"].hex()), ("index", spec["index"]),
                                                  ("position", position)]))
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d vectors to %s" % (sum(not x.startswith("#") for x in lines), path))


def check(path):
    passed = failed = 0
    with open(path, encoding="ascii") as f:
        for lineno, text in enumerate(f, 1):
            text = text.rstrip("\n")
            if not text or text.startswith("#"):
                continue
            record, *pairs = text.split(" ")
            fields = dict(p.split("=", 1) for p in pairs)
            name = fields.get("name", "?")
            try:
                if record == "fp":
                    got = fp_outputs(parse_fp_fields(fields))
                elif record == "ring":
                    members = [bytes.fromhex(m) for m in fields["members"].split(",")]
                    got = ring_outputs(members, int(fields["vnodes"]), bytes.fromhex(fields["fp"]))
                elif record == "vnode":
                    member = bytes.fromhex(fields["member"])
                    got = [("position", vnode_position(member, int(fields["index"])))]
                else:
                    raise ValueError("unknown record type " + record)
                bad = [(k, fields.get(k), str(val)) for k, val in got if fields.get(k) != str(val)]
            except (KeyError, ValueError) as e:
                bad = [("parse", "", repr(e))]
            if bad:
                failed += 1
                for key, want, have in bad:
                    print("FAIL line %d %s: %s: file has %s, computed %s" % (lineno, name, key, want, have))
            else:
                passed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 and passed > 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="FILE", help="write the golden vectors to FILE")
    group.add_argument("--check", metavar="FILE",
                       help="recompute every vector in FILE; exit 1 on any mismatch")
    args = parser.parse_args()
    if args.write:
        write(args.write)
        return 0
    return check(args.check)


if __name__ == "__main__":
    sys.exit(main())
