//! `bloomgate attack --plot`: requests, SQL queries and Redis keys over
//! time, three panels sharing the time axis, drawn as SVG with plotters.

use std::path::Path;

use plotters::prelude::*;

/// What the attack sampled: (seconds since start, value).
#[derive(Debug, Default, Clone)]
pub struct Series {
    /// Requests answered per second.
    pub requests_per_sec: Vec<(f64, f64)>,
    /// SQL point lookups per second (from the server's stats).
    pub sql_per_sec: Vec<(f64, f64)>,
    /// Redis keys added since the start.
    pub redis_keys: Vec<(f64, f64)>,
}

/// A panel: its caption, its points, its colour.
type Panel<'a> = (&'a str, &'a [(f64, f64)], RGBColor);

fn max_of(points: &[(f64, f64)]) -> f64 {
    points.iter().map(|p| p.1).fold(0.0, f64::max)
}

/// Draws `s` into an SVG file at `path`.
///
/// # Errors
/// Drawing or writing the file failed.
pub fn draw(path: &Path, title: &str, s: &Series) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let panels = root.split_evenly((3, 1));
    let end = s
        .requests_per_sec
        .iter()
        .chain(&s.redis_keys)
        .map(|p| p.0)
        .fold(1.0, f64::max);
    let specs: [Panel<'_>; 3] = [
        ("requests / s", &s.requests_per_sec, RGBColor(42, 157, 143)),
        ("SQL queries / s", &s.sql_per_sec, RGBColor(214, 40, 40)),
        ("Redis keys added", &s.redis_keys, RGBColor(231, 111, 81)),
    ];
    for (panel, (label, points, color)) in panels.iter().zip(specs) {
        // A flat zero line still gets a visible axis.
        let top = (max_of(points) * 1.1).max(1.0);
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .caption(label, ("sans-serif", 15))
            .build_cartesian_2d(0.0..end, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        chart.draw_series(
            AreaSeries::new(points.iter().copied(), 0.0, color.mix(0.25)).border_style(color),
        )?;
    }
    root.present()?;
    Ok(())
}
