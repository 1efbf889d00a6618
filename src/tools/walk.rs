//! The directory walk shared by grep and glob (being built).
