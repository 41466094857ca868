// ModuleTree view. Draws the rows whose ancestors are expanded; a checkbox or label click is sent
// to Python as an intent (Python applies the selection rule and sets `checked`); the expand
// toggle edits `expanded` directly.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "de-tree";
  el.appendChild(root);

  function send(message) { model.send(message); }

  function toggleExpanded(path) {
    const expanded = new Set(model.get("expanded"));
    if (expanded.has(path)) expanded.delete(path); else expanded.add(path);
    model.set("expanded", [...expanded]);
    model.save_changes();
  }

  function cell(className, text) {
    const span = document.createElement("span");
    span.className = className;
    span.textContent = text;
    return span;
  }

  function draw() {
    const expanded = new Set(model.get("expanded"));
    const checked = new Set(model.get("checked"));
    const partial = new Set(model.get("partial"));
    const active = model.get("active");
    const colours = model.get("colours");
    const matches = new Set(model.get("matches"));
    const aliases = new Set(model.get("aliases"));
    const rows = [];
    let hiddenBelow = Infinity; // nodes deeper than this are inside a collapsed ancestor
    for (const node of model.get("nodes")) {
      if (node.depth > hiddenBelow) continue;
      hiddenBelow = Infinity;
      const open = expanded.has(node.path);
      if (node.has_children && !open) hiddenBelow = node.depth;

      const row = document.createElement("div");
      row.className = "de-tree-node" + (node.path === active ? " de-tree-node-active" : "")
        + (matches.has(node.path) ? " de-tree-match" : "") + (aliases.has(node.path) ? " de-tree-alias" : "");
      row.dataset.path = node.path;
      row.dataset.state = node.state;
      row.style.paddingLeft = `${node.depth * 14}px`;

      const toggle = cell("de-tree-toggle", node.has_children ? (open ? "▾" : "▸") : "");
      if (node.has_children) toggle.addEventListener("click", () => toggleExpanded(node.path));
      row.appendChild(toggle);

      const swatch = cell("de-tree-swatch", "");
      swatch.style.background = colours[node.path] || "transparent";
      row.appendChild(swatch);

      const box = document.createElement("input");
      box.type = "checkbox";
      box.className = "de-tree-checkbox";
      box.checked = checked.has(node.path);
      box.indeterminate = partial.has(node.path);
      box.addEventListener("change", () => send({ type: "check", path: node.path, checked: box.checked }));
      row.appendChild(box);

      const label = cell("de-tree-label", node.label);
      label.title = `${node.path || "(root)"}: ${node.class}, ${node.params} parameters, ${node.bytes} on ${node.device}`;
      label.addEventListener("click", () => send({ type: "select", path: node.path }));
      row.appendChild(label);
      const klass = cell("de-tree-class", node.class);
      klass.title = node.class; // the class is the first text a narrow tree cuts
      row.appendChild(klass);
      row.appendChild(cell("de-tree-params", node.params));
      row.appendChild(cell("de-tree-bytes", node.bytes));
      row.appendChild(cell("de-tree-device", node.device));
      const state = cell(`de-tree-state de-state-${node.state}`, node.state);
      state.style.background = node.colour;
      row.appendChild(state);
      rows.push(row);
    }
    root.replaceChildren(...rows);
  }

  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => { pending = false; draw(); });
  };
  draw();
  for (const name of ["nodes", "checked", "partial", "expanded", "active", "colours", "matches", "aliases"]) {
    model.on(`change:${name}`, schedule);
  }
}

export default { render };
