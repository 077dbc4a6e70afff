#!/usr/bin/env python3
"""End-to-end differential check of `moeinfer-cli tokenize` on the conformance vocabularies
against a plain Python rendering of the reference's algorithm: special tokens cut out one by
one (longest text first, leftmost non-overlapping, only user-defined ones when parse_special is
off), the reference-style pre-tokenizer (tools/pretok_oracle.py), then byte-level BPE that
always merges the lowest-ranked adjacent pair (leftmost on ties).

usage: tools/bpe_oracle.py PATH/TO/moeinfer-cli [--n 1500] [--seed 1] [--conformance DIR]

Random texts mix ordinary text with the vocabulary's own special-token strings (whole, cut,
overlapping). Token types are taken after the reference's load-time re-flagging, which this
script repeats for the names it knows (EOG names -> control; harmony tokens -> user-defined).
"""
import argparse, json, os, random, struct, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pretok_oracle as pre  # noqa: E402


def read_gguf_meta(path):
    """Metadata of a GGUF v2/v3 file (strings, scalars, arrays of them)."""
    f = open(path, "rb")
    magic, version = f.read(4), struct.unpack("<I", f.read(4))[0]
    assert magic == b"GGUF" and version in (2, 3)
    _, n_kv = struct.unpack("<QQ", f.read(16))
    scal = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def rstr():
        n = struct.unpack("<Q", f.read(8))[0]
        return f.read(n).decode("utf-8", "surrogateescape")

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = struct.unpack("<IQ", f.read(12))
            if et in scal:
                sz = struct.calcsize(scal[et])
                data = f.read(sz * n)
                return [struct.unpack_from(scal[et], data, i * sz)[0] for i in range(n)]
            return [rval(et) for _ in range(n)]
        return struct.unpack(scal[t], f.read(struct.calcsize(scal[t])))[0]

    meta = {}
    for _ in range(n_kv):
        k = rstr()
        meta[k] = rval(struct.unpack("<I", f.read(4))[0])
    return meta


BYTE_TO_CHAR = {}
_printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
_n = 0
for _b in range(256):
    if _b in _printable:
        BYTE_TO_CHAR[_b] = chr(_b)
    else:
        BYTE_TO_CHAR[_b] = chr(256 + _n)
        _n += 1

EOG = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
       "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"]


class Tok:
    def __init__(self, meta):
        self.tokens = meta["tokenizer.ggml.tokens"]
        self.types = list(meta.get("tokenizer.ggml.token_type", [1] * len(self.tokens)))
        self.id = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {}
        for r, m in enumerate(meta["tokenizer.ggml.merges"]):
            k = m.find(" ", 1)
            a, b = m[:k], m[k + 1:]
            self.rank.setdefault((a, b), r)
        self.pre = meta["tokenizer.ggml.pre"]
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.bos = meta.get("tokenizer.ggml.bos_token_id", -1)
        for name in EOG:
            if name in self.id:
                self.types[self.id[name]] = 3
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]:
            if name in self.id:
                self.types[self.id[name]] = 4
        if all(n in self.id for n in ["<|return|>", "<|call|>", "<|end|>"]):
            self.types[self.id["<|end|>"]] = 4
        self.specials = sorted([i for i, t in enumerate(self.types) if t in (2, 3, 4)],
                               key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogateescape")))

    def partition(self, text, parse_special):
        frags = [text]  # str or int
        for sid in self.specials:
            if not parse_special and self.types[sid] != 4:
                continue
            st = self.tokens[sid]
            out = []
            for fr in frags:
                if isinstance(fr, int):
                    out.append(fr)
                    continue
                while True:
                    k = fr.find(st)
                    if k < 0:
                        break
                    if k > 0:
                        out.append(fr[:k])
                    out.append(sid)
                    fr = fr[k + len(st):]
                if fr:
                    out.append(fr)
            frags = out
        return frags

    def bpe(self, word):
        syms = [BYTE_TO_CHAR[b] for b in word.encode("utf-8")]
        while len(syms) > 1:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                r = self.rank.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            syms[bi:bi + 2] = [syms[bi] + syms[bi + 1]]
        return [self.id[s] for s in syms]

    def encode(self, text, add_special, parse_special):
        ids = [self.bos] if add_special and self.add_bos else []
        for fr in self.partition(text, parse_special):
            if isinstance(fr, int):
                ids.append(fr)
            else:
                for w in pre.split(self.pre, fr):
                    ids += self.bpe(w)
        return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conformance", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                          "shared", "conformance"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    bad = 0
    for model in ["qwen3moe-f16.gguf", "deepseek2-f16.gguf", "gpt-oss-f16.gguf"]:
        path = os.path.join(a.conformance, "models", model)
        if not os.path.exists(path):
            print(f"{model}: missing, skipped")
            continue
        tok = Tok(read_gguf_meta(path))
        spec_texts = [tok.tokens[i] for i in tok.specials if tok.types[i] in (3, 4)][:400]
        rows = []
        for _ in range(a.n):
            parts = []
            for _ in range(rng.randint(1, 12)):
                r = rng.random()
                if r < 0.25 and spec_texts:
                    s = rng.choice(spec_texts)
                    if rng.random() < 0.2:  # cut or doubled pieces
                        s = s[: rng.randint(1, len(s))] + rng.choice(spec_texts)
                    parts.append(s)
                else:
                    parts.append(pre.random_text(rng, rng.randint(1, 6)))
            rows.append({"text": "".join(parts), "add_special": rng.random() < 0.3, "parse_special": rng.random() < 0.5})
        inp = "".join(json.dumps(r) + "\n" for r in rows)
        r = subprocess.run([a.cli, "tokenize", "-m", path], input=inp, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{model}: cli failed: {r.stderr.strip()}")
            bad += 1
            continue
        got = [json.loads(l)["ids"] for l in r.stdout.split("\n") if l]
        diffs = [(row, g) for row, g in zip(rows, got)
                 if g != tok.encode(row["text"], row["add_special"], row["parse_special"])]
        print(f"{model}: {len(rows) - len(diffs)}/{len(rows)} agree")
        for row, g in diffs[:3]:
            print("  row", json.dumps(row), "\n   got ", g[:40], "\n   want",
                  tok.encode(row["text"], row["add_special"], row["parse_special"])[:40])
        bad += len(diffs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
