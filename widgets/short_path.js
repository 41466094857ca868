// shortPath(name, width): a port of explorer.naming.short_path, for cells whose width is only known
// in the browser. Keep the two in step: tests/support/short_path_cases.json is the spec both test.
// The rule: a name that fits is unchanged; numeric parts (layer indices) and the last part are always
// kept; the second-to-last part, then each index's container (right to left), the first part, then the
// rest (right to left) are added back while the result fits; each run of left-out parts becomes "…".
const ELLIPSIS = "\u2026";

function joined(parts, kept) {
  let text = "";
  let elided = false;
  parts.forEach((part, i) => {
    if (!kept.has(i)) { elided = true; return; }
    text += (text ? "." : "") + (elided ? ELLIPSIS : "") + part;
    elided = false;
  });
  return text;
}

function keepOrder(parts) {
  const last = parts.length - 1;
  const isIndex = (part) => /^[0-9]+$/.test(part);
  const order = [last - 1];
  for (let i = last; i > 0; i--) if (isIndex(parts[i]) && !isIndex(parts[i - 1])) order.push(i - 1);
  order.push(0);
  for (let i = last - 1; i > 0; i--) order.push(i);
  return order.filter((i, n) => i >= 0 && i < last && order.indexOf(i) === n);
}

export function shortPath(name, width) {
  if ([...name].length <= width) return name;
  const parts = name.split(".");
  const kept = new Set([parts.length - 1]);
  parts.forEach((part, i) => { if (/^[0-9]+$/.test(part)) kept.add(i); });
  for (const i of keepOrder(parts)) {
    if (kept.has(i)) continue;
    const trial = new Set(kept).add(i);
    if ([...joined(parts, trial)].length <= width) kept.add(i);
  }
  return joined(parts, kept);
}

// shortNames(text, width): a cell listing names ("a.b.0.w, c.d.1.w") cut to `width` characters: the
// first name by shortPath and a count of the others ("…0.w +1"), so an alias or tie list keeps the
// layer index of the name it shows; the cell's title holds the whole list.
export function shortNames(text, width) {
  if ([...text].length <= width) return text;
  const names = text.split(", ");
  if (names.length === 1) return shortPath(text, width);
  const more = ` +${names.length - 1}`;
  return shortPath(names[0], Math.max(1, width - more.length)) + more;
}
