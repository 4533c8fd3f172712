// The application's store: it reads its settings from the environment, as
// the project's code does in production.
const { Pool } = require("pg");

exports.openStore = () => {
  const url = process.env.APP_DATABASE_URL;
  if (!url) throw new Error("APP_DATABASE_URL is not set");
  const pool = new Pool({ connectionString: url, max: 2 });
  return {
    addUser: (name) => pool.query("INSERT INTO users (name) VALUES ($1)", [name]),
    names: async () => (await pool.query("SELECT name FROM users ORDER BY id")).rows.map((r) => r.name),
    database: async () => (await pool.query("SELECT current_database() AS d")).rows[0].d,
    close: () => pool.end(),
  };
};
