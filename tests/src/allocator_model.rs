//! Operation enums and reference models shared by proptests and fuzz targets.
