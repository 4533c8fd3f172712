/* node-pg-migrate 6: a CommonJS migration */
exports.up = (pgm) => {
  pgm.createTable("users", {
    id: "id",
    name: { type: "text", notNull: true, unique: true },
  });
  pgm.sql("INSERT INTO users (name) VALUES ('seeded')");
};

exports.down = (pgm) => {
  pgm.dropTable("users");
};
