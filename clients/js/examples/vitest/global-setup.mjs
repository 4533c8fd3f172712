import { fileURLToPath } from "node:url";
import { withPg } from "pgfork";
import { pgforkSetup } from "pgfork/vitest-setup";

export default pgforkSetup({
  migrations: fileURLToPath(new URL("../migrations", import.meta.url)),
  seed: (url) => withPg(url, (c) => c.query("INSERT INTO users (name) VALUES ('seeded')")),
  extraKey: "seed v1", // change it when the seed changes: its code is not hashed
});
