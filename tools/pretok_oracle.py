#!/usr/bin/env python3
"""Differential check of moeinfer's hand-written pre-tokenizers against an emulation of the
reference's regex pipeline (llama.cpp: code points collapsed to one byte per category, the
patterns run by a backtracking regex engine, unmatched stretches kept as words).

usage: tools/pretok_oracle.py PATH/TO/moeinfer-cli [--n 3000] [--seed 1] [--conformance DIR]

For each pattern a vocabulary is needed: the conformance models give qwen2 / deepseek-v3 /
gpt-4o, tiny GGUFs written here give gpt2 and llama-bpe. Random strings (valid UTF-8, all
planes, heavy on the classes the patterns care about) go through `moeinfer-cli tokenize --words`
and through the emulation; any difference is printed. Exit status 0 only if all agree.
Categories come from /usr/share/unicode (UnicodeData.txt, PropList.txt), parsed here.
"""
import argparse, json, os, random, re, struct, subprocess, sys, tempfile

UCD = "/usr/share/unicode"


def load_ucd():
    cat = {}
    first = None
    for line in open(os.path.join(UCD, "UnicodeData.txt"), encoding="utf-8"):
        f = line.split(";")
        cp, name, gc = int(f[0], 16), f[1], f[2]
        if name.endswith("First>"):
            first = cp
        elif name.endswith("Last>"):
            for c in range(first, cp + 1):
                cat[c] = gc
        else:
            cat[cp] = gc
    ws = set()
    for line in open(os.path.join(UCD, "PropList.txt"), encoding="utf-8"):
        m = re.match(r"^([0-9A-F]+)(?:\.\.([0-9A-F]+))?\s*;\s*White_Space", line)
        if m:
            lo = int(m.group(1), 16)
            ws.update(range(lo, int(m.group(2) or m.group(1), 16) + 1))
    return cat, ws


CAT, WS = load_ucd()
COLLAPSE = {"N": 0xD1, "L": 0xD2, "P": 0xD3, "M": 0xD4, "S": 0xD5}


def collapse(text):
    out = bytearray()
    for ch in text:
        cp = ord(ch)
        if cp < 128:
            out.append(cp)
        elif cp in WS:
            out.append(0x0B)
        else:
            out.append(COLLAPSE.get(CAT.get(cp, "Cn")[0], 0xD0))
    return bytes(out)


# \p{..} as the reference rewrites them for the collapsed text
L = rb"\xD2A-Za-z"
N = rb"\xD10-9"
P = rb"\xD3!-#%-*,-/:-;?-@\[-\]_\{\}"
S = rb"\xD5\$\+<->\^`\|"
M = rb"\xD4"
C = rb"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# Cased-letter class of the DeepSeek-V2 (deepseek-llm) pattern, as code point ranges.
DS_CASED = "".join("%s-%s" % (chr(a), chr(b)) for a, b in [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3),
    (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943)])

PATTERNS = {
    "gpt2": [rb"'s|'t|'re|'ve|'m|'ll|'d| ?[" + L + rb"]+| ?[" + N + rb"]+| ?[^\s" + L + N + rb"]+|\s+(?!\S)"],
    "llama-bpe": [C + rb"|[^\r\n" + L + N + rb"]?[" + L + rb"]+|[" + N + rb"]{1,3}| ?[^\s" + L + N +
                  rb"]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [C + rb"|[^\r\n" + L + N + rb"]?[" + L + rb"]+|[" + N + rb"]| ?[^\s" + L + N +
              rb"]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "gpt-4o": [rb"[^\r\n" + L + N + rb"]?((?=[" + L + rb"])([^a-z]))*((?=[" + L + rb"])([^A-Z]))+" + C +
               rb"?|[^\r\n" + L + N + rb"]?((?=[" + L + rb"])([^a-z]))+((?=[" + L + rb"])([^A-Z]))*" + C +
               rb"?|[" + N + rb"]{1,3}| ?[^\s" + L + N + rb"]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "deepseek-v3": [rb"[" + N + rb"]{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    rb"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n" + L + P + S + rb"]?[" + L + M +
                    rb"]+| ?[" + P + S + rb"]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "deepseek-llm": ["[\r\n]", "\\s?[" + DS_CASED + "]+",
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "\\s+\\Z",
                     "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", rb"[" + N + rb"]+"],
}


def split(pre, text):
    coll = collapse(text)
    # patterns without \p{..} run on the code points, non-ASCII whitespace replaced by \v
    wtext = "".join("\x0b" if ord(ch) > 0x7F and ord(ch) in WS else ch for ch in text)
    segs = [(0, len(text))]
    for pat in PATTERNS[pre]:
        rx = re.compile(pat, re.ASCII) if isinstance(pat, str) else re.compile(pat)
        subject = wtext if isinstance(pat, str) else coll
        out = []
        for b, e in segs:
            at = b
            for m in rx.finditer(subject, b, e):
                if m.start() > at:
                    out.append((at, m.start()))
                out.append((m.start(), m.end()))
                at = m.end()
            if at < e:
                out.append((at, e))
        segs = out
    return [text[b:e] for b, e in segs]


def random_text(rng, n):
    pools = [
        "abcXYZ", "'sStTmMdDrReEvVlL", "0123456789", " ", "  ", "\t", "\n", "\r\n", "!?.,;:-/~_()[]{}<>|$+^`\"#%&*@=\\",
        "\u00e9\u00c9\u00df\u0131", "\u0301\u0308\u093f\u0940\u094d", "\u0939\u0928\u0926\u1780\u17b6",
        "\u4e2d\u6587\u5b57\u9fa5\u9fa6\u3400", "\u3042\u30a2\u30fc\u309f\u30ff", "\uac00\ud7a3",
        "\u00a0\u3000\u2028\u0085\u200b\u1680", "\u0663\u00b2\u2160\u2153", "\U0001F600\U0001F3FB\u200d\u2764\ufe0f",
        "\u01c5\u02b0\u1d2c\u2c6d\u0245", "\u00aa\u00ba\u00b5\u1e9e",
        "\u1f7d\u1fbe\u212a\u2126\u0394\u03b4\u0416", "\uff01\uff21\uff41\u3001\u3002\u2018\u201c", "\u0800\u4e00\uac00\ud7ff",
    ]
    s = []
    for _ in range(n):
        r = rng.random()
        if r < 0.85:
            pool = rng.choice(pools)
            s.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 4))))
        else:
            cp = rng.randint(0, 0x10FFFF)
            if 0xD800 <= cp <= 0xDFFF:
                cp = 0xFFFD
            s.append(chr(cp))
    return "".join(s)


def gguf_vocab(path, pre):
    """Minimal GGUF v3: byte-level alphabet as tokens, no merges, the given pre name."""
    def s(b):
        return struct.pack("<Q", len(b)) + b
    toks = [chr(c).encode() for c in range(0x21, 0x7F)] + [chr(c).encode() for c in range(0xA1, 0x180)]
    kv = [(b"tokenizer.ggml.model", 8, s(b"gpt2")), (b"tokenizer.ggml.pre", 8, s(pre.encode())),
          (b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(s(t) for t in toks)),
          (b"tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 0))]
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for k, t, v in kv:
        data += s(k) + struct.pack("<I", t) + v
    with open(path, "wb") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conformance", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                          "shared", "conformance"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    models = {"gpt2": os.path.join(tmp, "gpt2.gguf"), "llama-bpe": os.path.join(tmp, "llama.gguf"),
              "deepseek-llm": os.path.join(tmp, "deepseek-llm.gguf"),
              "qwen2": os.path.join(a.conformance, "models", "qwen3moe-f16.gguf"),
              "deepseek-v3": os.path.join(a.conformance, "models", "deepseek2-f16.gguf"),
              "gpt-4o": os.path.join(a.conformance, "models", "gpt-oss-f16.gguf")}
    gguf_vocab(models["gpt2"], "gpt2")
    gguf_vocab(models["llama-bpe"], "llama-bpe")
    gguf_vocab(models["deepseek-llm"], "deepseek-llm")
    rng = random.Random(a.seed)
    bad = 0
    for pre, model in models.items():
        if not os.path.exists(model):
            print(f"{pre}: {model} missing, skipped")
            continue
        texts = [random_text(rng, rng.randint(1, 40)) for _ in range(a.n)]
        inp = "".join(json.dumps({"text": t}) + "\n" for t in texts)
        r = subprocess.run([a.cli, "tokenize", "-m", model, "--words"], input=inp, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{pre}: cli failed: {r.stderr.strip()}")
            bad += 1
            continue
        got = [json.loads(l)["words"] for l in r.stdout.split("\n") if l]
        diffs = [(t, g, split(pre, t)) for t, g in zip(texts, got) if g != split(pre, t)]
        print(f"{pre}: {len(texts) - len(diffs)}/{len(texts)} agree")
        for t, g, w in diffs[:3]:
            print("  text", json.dumps(t), "\n   got ", json.dumps(g), "\n   want", json.dumps(w))
        bad += len(diffs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
