// node --test tests/widgets/short_path.test.mjs: the JS port of explorer.naming.short_path gives
// the short names of the shared spec (tests/widgets/test_short_path_js.py runs this under pytest).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { shortNames, shortPath } from "../../widgets/short_path.js";

const spec = JSON.parse(readFileSync(new URL("../support/short_path_cases.json", import.meta.url), "utf8"));

test("shortPath gives every short name of the shared spec", () => {
  for (const { name, width, short } of spec.cases) assert.equal(shortPath(name, width), short, `${name} at ${width}`);
});

test("24 layer names at 18 characters are distinct and each shows its index", () => {
  const shorts = Array.from({ length: 24 }, (_, i) => shortPath(`model.layers.${i}.self_attn.q_proj.weight`, 18));
  assert.equal(new Set(shorts).size, 24);
  shorts.forEach((short, i) => assert.ok(short.startsWith(`\u2026${i}.`), short));
});

test("a list of names shows its first name shortened and a count of the others", () => {
  const tied = "model.layers.17.self_attn.q_proj.weight, model.layers.17.self_attn.k_proj.weight";
  assert.equal(shortNames(tied, 200), tied);
  assert.equal(shortNames(tied, 21), "\u202617.\u2026q_proj.weight +1");
  assert.equal(shortNames("model.layers.3.mlp.up_proj.weight", 16), shortPath("model.layers.3.mlp.up_proj.weight", 16));
});
