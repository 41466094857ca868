// SearchBox view: a text input and a regex checkbox. Typing sets `query` (debounced); Enter asks
// Python for the next match, Shift+Enter for the previous one. Python searches and writes `counts`.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "de-search";
  const input = document.createElement("input");
  input.type = "search";
  input.className = "de-search-input";
  input.placeholder = "search modules, tensors, ops, shapes, dtypes (Enter: next)";
  input.value = model.get("query");
  const regexLabel = document.createElement("label");
  regexLabel.className = "de-search-regex";
  const regex = document.createElement("input");
  regex.type = "checkbox";
  regex.checked = model.get("regex");
  regexLabel.append(regex, document.createTextNode(" regex"));
  const counts = document.createElement("span");
  counts.className = "de-search-counts";
  root.append(input, regexLabel, counts);
  el.appendChild(root);

  let timer = null;
  const push = () => {
    clearTimeout(timer);
    model.set("query", input.value);
    model.set("regex", regex.checked);
    model.save_changes();
  };
  input.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(push, 150); });
  regex.addEventListener("change", push);
  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter") return;
    event.preventDefault();
    if (input.value !== model.get("query")) push();
    model.send({ type: event.shiftKey ? "previous" : "next" });
  });
  const showCounts = () => {
    counts.textContent = model.get("counts");
    counts.classList.toggle("de-search-error", model.get("error"));
  };
  const showQuery = () => { if (input.value !== model.get("query")) input.value = model.get("query"); };
  showCounts();
  model.on("change:counts", showCounts);
  model.on("change:error", showCounts);
  model.on("change:query", showQuery);
  return () => clearTimeout(timer);
}

export default { render };
