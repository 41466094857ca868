// GraphView: shows the Graphviz SVG Python sends, fitted to the view's width, with wheel zoom, drag
// pan and double-click to fit again.
// A click on a node or cluster sets `clicked` to its <title> (the graphviz node name), which is
// the whole contract with Python. Python also sends `highlighted` (search matches) and `aliases`
// (names sharing the open tensor's storage) as node names, and `module_colours` (the overlay).
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "de-graph-root";
  const viewport = document.createElement("div");
  viewport.className = "de-graph-viewport";
  const canvas = document.createElement("div");
  canvas.className = "de-graph-canvas";
  viewport.appendChild(canvas);
  const legend = document.createElement("div");
  legend.className = "de-graph-legend";
  const controls = document.createElement("div");
  controls.className = "de-graph-controls";
  const fitButton = document.createElement("button");
  fitButton.className = "de-graph-fit jupyter-button";
  fitButton.textContent = "fit";
  fitButton.title = "show the whole drawing (labels may be too small to read)";
  const readableButton = document.createElement("button");
  readableButton.className = "de-graph-readable jupyter-button";
  readableButton.textContent = "readable";
  readableButton.title = "zoom so node labels are readable, from the top left";
  const scaleLabel = document.createElement("span");
  scaleLabel.className = "de-graph-scale";
  controls.append(fitButton, readableButton, scaleLabel);
  root.append(controls, viewport, legend);
  el.appendChild(root);

  let scale = 1, x = 0, y = 0;
  let moved = false; // the user zoomed or panned: stop refitting on resize
  const apply = () => {
    canvas.style.transform = `translate(${x}px, ${y}px) scale(${scale})`;
    const px = labelPixels();
    scaleLabel.textContent = `zoom ${Math.round(scale * 100)}%` + (px ? ` · labels ${px.toFixed(1)} px` : "");
    root.dataset.scale = String(scale);
    root.dataset.labelPx = px ? px.toFixed(2) : "";
  };

  // Screen pixels of the smallest node label at the current scale (SVG units are points).
  function labelPixels() {
    const svg = canvas.querySelector("svg");
    if (!svg) return 0;
    let smallest = Infinity;
    for (const text of canvas.querySelectorAll("g.node text")) {
      const size = parseFloat(text.getAttribute("font-size"));
      if (size && size < smallest) smallest = size;
    }
    if (smallest === Infinity) return 0;
    const box = svg.viewBox && svg.viewBox.baseVal;
    const unit = box && box.width ? svg.width.baseVal.value / box.width : 1; // px per SVG unit at scale 1
    return smallest * unit * scale;
  }

  viewport.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = viewport.getBoundingClientRect();
    const px = event.clientX - box.left, py = event.clientY - box.top;
    const factor = Math.exp(-event.deltaY * 0.0015);
    const next = Math.min(20, Math.max(0.05, scale * factor));
    x = px - (px - x) * (next / scale);
    y = py - (py - y) * (next / scale);
    scale = next;
    moved = true;
    apply();
  }, { passive: false });

  let drag = null; // where a mouse press started, and whether it became a pan
  viewport.addEventListener("mousedown", (event) => {
    drag = { x: event.clientX, y: event.clientY, ox: x, oy: y, moved: false };
  });
  const onMove = (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x, dy = event.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (!drag.moved) return;
    x = drag.ox + dx; y = drag.oy + dy;
    moved = true;
    apply();
  };
  const onUp = () => { setTimeout(() => { drag = null; }, 0); };
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  viewport.addEventListener("dblclick", () => { moved = true; fit(); });
  fitButton.addEventListener("click", () => { moved = true; fit(); });
  readableButton.addEventListener("click", () => { moved = true; readable(); });
  // The view may be drawn while its tab is still hidden (no size yet): fit once it gets a size.
  const resize = new ResizeObserver(() => { if (!moved) firstView(); });
  resize.observe(viewport);

  // "fit": the whole drawing in the view (never enlarged), however small its labels get.
  function fit() {
    const svg = canvas.querySelector("svg");
    scale = 1; x = 0; y = 0;
    if (svg && viewport.clientWidth && viewport.clientHeight) {
      const width = svg.width.baseVal.value, height = svg.height.baseVal.value;
      if (width && height) scale = Math.min(1, viewport.clientWidth / width, viewport.clientHeight / height);
    }
    apply();
  }

  // The first view: as wide as the view allows, but never so small that node labels drop under
  // `min_label_px` (Python's choice); the rest is reached by dragging. A hidden viewport has no
  // size yet: keep scale 1 then.
  function readable() {
    const svg = canvas.querySelector("svg");
    scale = 1; x = 0; y = 0;
    if (svg && viewport.clientWidth) {
      const width = svg.width.baseVal.value;
      const atOne = labelPixels(); // scale is 1 here
      const floor = atOne ? model.get("min_label_px") / atOne : 1;
      if (width) scale = Math.max(Math.min(1, viewport.clientWidth / width), Math.min(1, floor));
    }
    apply();
    // Start where the drawing starts: the node nearest its top-left corner, not the empty corner of
    // a large cluster, nor the legend (a node Graphviz may place first).
    const origin = canvas.getBoundingClientRect();
    let best = null;
    for (const node of canvas.querySelectorAll("g.node")) {
      const title = node.querySelector(":scope > title");
      if (title && title.textContent.trim() === "legend:") continue;
      const box = node.getBoundingClientRect();
      if (!box.width) continue;
      const left = box.left - origin.left, top = box.top - origin.top;
      if (!best || left + top < best.left + best.top) best = { left, top };
    }
    if (best) { x = 12 - best.left; y = 12 - best.top; apply(); }
  }

  viewport.addEventListener("click", (event) => {
    if (drag && drag.moved) return; // the end of a pan, not a click
    const target = event.target.closest("g.node, g.cluster");
    if (!target) return;
    const title = target.querySelector(":scope > title");
    if (!title) return;
    model.set("clicked", title.textContent.trim());
    model.save_changes();
  });

  // The diagram carries its own colour legend (drawn by explorer.render); this line says what the
  // mouse does.
  const hint = document.createElement("span");
  hint.className = "de-graph-legend-hint";
  hint.textContent =
    "click a module: select it · a \"×N\" node: unfold it · a tensor: open it · wheel: zoom · drag: pan · double-click: fit";
  legend.appendChild(hint);

  function markSelected() {
    const wanted = model.get("selected");
    for (const node of canvas.querySelectorAll("g.node")) {
      const title = node.querySelector(":scope > title");
      node.classList.toggle("de-graph-selected", !!wanted && !!title && title.textContent.trim() === wanted);
    }
  }

  // Search matches and the open tensor's storage sharers get a class; module clusters (and
  // collapsed module nodes) are filled with the overlay colour Python chose for their path.
  function markHighlighted() {
    const matches = new Set(model.get("highlighted"));
    const aliases = new Set(model.get("aliases"));
    for (const node of canvas.querySelectorAll("g.node, g.cluster")) {
      const title = node.querySelector(":scope > title");
      const name = title ? title.textContent.trim().replace(/^cluster_/, "") : "";
      node.classList.toggle("de-graph-highlighted", matches.has(name));
      node.classList.toggle("de-graph-alias", aliases.has(name));
    }
  }

  function paintModules() {
    const colours = model.get("module_colours");
    for (const node of canvas.querySelectorAll("g.node, g.cluster")) {
      const title = node.querySelector(":scope > title");
      const name = title ? title.textContent.trim().replace(/^cluster_/, "") : "";
      if (!name.startsWith("module:")) continue;
      const shape = node.querySelector(":scope > polygon, :scope > path");
      if (!shape) continue;
      if (shape.dataset.fill === undefined) shape.dataset.fill = shape.getAttribute("fill") || "";
      const colour = colours[name.slice("module:".length)];
      shape.setAttribute("fill", colour ? colour + (node.classList.contains("cluster") ? "55" : "") : shape.dataset.fill);
    }
  }

  // How a new drawing opens: Python's `first_view` ("fit" for an outline, else "readable").
  function firstView() {
    if (model.get("first_view") === "fit") fit();
    else readable();
  }

  function draw() {
    canvas.innerHTML = model.get("svg"); // Graphviz output: escaped labels, no scripts
    moved = false;
    firstView();
    markSelected();
    markHighlighted();
    paintModules();
  }

  draw();
  model.on("change:svg", draw);
  model.on("change:selected", markSelected);
  model.on("change:highlighted", markHighlighted);
  model.on("change:aliases", markHighlighted);
  model.on("change:module_colours", paintModules);
  return () => {  // the view is removed: drop what outlives its element
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
    resize.disconnect();
  };
}

export default { render };
