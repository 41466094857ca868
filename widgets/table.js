// DataTable view: draws the rows Python sends; header clicks set sort_by/ascending, row clicks set
// `selected`. No data logic here: sorting, filtering and formatting happen in Python. The one rule
// drawn here is cutting: a `path_columns` cell narrower than its dotted name shows shortPath of it
// (short_path.js, prepended to this file by table.py) for its width, refitted when the table resizes.
// `row_groups` (decided in Python) puts runs of rows in their own <tbody> under a header row showing
// their module once; their first path cell then shows the name less that module. Header rows have no
// key and no click: `selected` only ever names a row.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "de-table-wrap";
  el.appendChild(root);

  function draw() {
    root.replaceChildren();
    const table = document.createElement("table");
    table.className = "de-table";
    const head = table.createTHead().insertRow();
    const sortBy = model.get("sort_by");
    const ascending = model.get("ascending");
    const sortable = model.get("sortable");
    const labels = model.get("labels");
    model.get("columns").forEach((column, index) => {
      const th = document.createElement("th");
      th.className = "de-table-header";
      th.dataset.column = column;
      th.textContent = (labels[index] || column) + (column === sortBy ? (ascending ? " ▲" : " ▼") : "");
      if (sortable) {
        th.addEventListener("click", () => {
          if (model.get("sort_by") === column) {
            model.set("ascending", !model.get("ascending"));
          } else {
            model.set("sort_by", column);
            model.set("ascending", true);
          }
          model.save_changes();
        });
      }
      head.appendChild(th);
    });
    const keys = model.get("row_keys");
    const colours = model.get("row_colours");
    const selected = model.get("selected");
    const highlighted = new Set(model.get("highlighted"));
    const columns = model.get("columns");
    const paths = new Set(model.get("path_columns"));
    const groupColumn = columns.indexOf(model.get("path_columns")[0]);
    const groupAt = new Map(model.get("row_groups").map((group) => [group.start, group]));
    let body = null;
    let group = null;
    model.get("rows").forEach((cells, i) => {
      if (group && i >= group.stop) group = null;
      if (!body || groupAt.has(i) || (!group && body.classList.contains("de-table-grouped"))) {
        group = groupAt.get(i) || null;
        body = table.createTBody();
        if (group) groupHeader(body, group, columns.length);
      }
      const tr = body.insertRow();
      tr.className = "de-table-row" + (keys[i] === selected ? " de-table-row-selected" : "")
        + (highlighted.has(keys[i]) ? " de-table-row-highlighted" : "");
      tr.dataset.key = keys[i];
      if (colours[i]) tr.style.borderLeft = `4px solid ${colours[i]}`;
      cells.forEach((cell, index) => {
        const td = tr.insertCell();
        td.className = "de-table-cell" + (paths.has(columns[index]) ? " de-table-path" : "");
        td.dataset.column = columns[index];
        // the whole text in the title, where the cell cuts it or its group header holds its module
        td.title = cell;
        if (group && index === groupColumn) td.classList.add("de-table-grouped-name");
        td.textContent = group && index === groupColumn ? cell.slice(group.prefix.length + 1) : cell;
        td.dataset.text = td.textContent; // what fitPaths shortens
      });
      tr.addEventListener("click", () => {
        model.set("selected", keys[i]);
        model.save_changes();
      });
    });
    root.appendChild(table);
    if (model.get("caption")) {
      const caption = document.createElement("div");
      caption.className = "de-table-caption";
      caption.textContent = model.get("caption");
      root.appendChild(caption);
    }
    fitPaths();
  }

  function groupHeader(body, group, span) {
    body.classList.add("de-table-grouped");
    const td = body.insertRow().insertCell();
    td.parentElement.className = "de-table-group";
    td.className = "de-table-group-cell";
    td.colSpan = span;
    td.title = group.prefix;
    td.textContent = `${group.prefix} · ${group.stop - group.start}`;
  }

  // Each path cell shows its text (its whole name, or the name less its group's module) where that
  // fits, else shortPath of it for the characters its content box holds (the table's font is
  // monospace). All reads, then all writes.
  function fitPaths() {
    const cells = [...root.querySelectorAll("td.de-table-path")];
    if (!cells.length || !root.isConnected) return;
    cells.forEach((td) => { td.textContent = td.dataset.text; });
    const probe = document.createElement("span");
    probe.textContent = "0".repeat(20);
    cells[0].appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 20;
    probe.remove();
    if (!charWidth) return; // not laid out (a hidden tab): the resize observer refits when shown
    const fits = cells.map((td) => {
      if (td.scrollWidth <= td.clientWidth) return null;
      const style = getComputedStyle(td);
      const room = td.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      return Math.max(1, Math.floor(room / charWidth + 0.01));
    });
    cells.forEach((td, i) => { if (fits[i] !== null) td.textContent = shortNames(td.dataset.text, fits[i]); });
  }

  // One redraw per batch of changes (Python sends several traits in one message).
  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => { pending = false; draw(); });
  };
  draw();
  for (const name of ["columns", "labels", "rows", "row_keys", "row_colours", "selected", "highlighted", "sort_by", "ascending", "caption", "path_columns", "row_groups"]) {
    model.on(`change:${name}`, schedule);
  }
  let lastWidth = -1;
  const resized = new ResizeObserver(() => {
    if (root.clientWidth === lastWidth) return;
    lastWidth = root.clientWidth;
    fitPaths();
  });
  resized.observe(root);
  return () => resized.disconnect();
}

export default { render };
