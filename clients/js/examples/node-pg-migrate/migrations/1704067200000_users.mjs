export const up = (pgm) => {
  pgm.createTable("users", {
    id: "id",
    name: { type: "text", notNull: true, unique: true },
  });
};

export const down = (pgm) => {
  pgm.dropTable("users");
};
