// ExportBar view: one button per (target, format). A click sends the intent to Python, which
// builds the file, saves it beside the notebook and sends its bytes back; the browser then offers
// them as a download. No file is built here.
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "de-export";
  const label = document.createElement("span");
  label.className = "de-export-label";
  label.textContent = "export";
  root.appendChild(label);
  for (const [target, format] of model.get("choices")) {
    const button = document.createElement("button");
    button.className = "de-export-button jupyter-button";
    button.dataset.target = target;
    button.dataset.format = format;
    button.textContent = `${target} ${format.toUpperCase()}`;
    button.addEventListener("click", () => model.send({ type: "export", target, format }));
    root.appendChild(button);
  }
  const status = document.createElement("span");
  status.className = "de-export-status";
  root.appendChild(status);
  el.appendChild(root);

  const showStatus = () => { status.textContent = model.get("status"); };
  showStatus();
  model.on("change:status", showStatus);
  model.on("msg:custom", (message, buffers) => {
    if (message.type !== "download" || !buffers.length) return;
    const blob = new Blob([buffers[0]], { type: message.mime });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = message.filename;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  });
}

export default { render };
